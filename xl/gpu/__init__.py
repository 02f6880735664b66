"""GPUs: the NVML choke point (``nvml``), CUDA_VISIBLE_DEVICES resolution (``devices``), ``xl gpus``."""
