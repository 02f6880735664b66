"""The supervisor's telemetry: collector, sampler, log parsing and the diagnoses made from them."""
