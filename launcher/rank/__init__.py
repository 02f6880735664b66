"""What runs inside each rank before the user's code: the entry point (``rank.entry``)."""
