"""GPUs: the NVML choke point (``nvml``) and the records it returns (``records``), who each GPU
process is (``processes``), CUDA_VISIBLE_DEVICES resolution (``devices``), ``xl gpus`` (``cli``)."""
