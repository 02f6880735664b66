"""The run directory's contract and its one owner: the layout, run.json's typed record
(runrecord.py), events and metrics lines, the rank outcome rule, the store (list and resolve runs)
and settle. What viewers derive from it lives in xl.launcher.view."""
