"""The distributions on PyPI of import names they do not share, for the fix of a missing module
(``pip install <distribution>``). Data only."""

from __future__ import annotations

# Import names whose distribution on PyPI is named otherwise.
DISTRIBUTIONS = {
    "cv2": "opencv-python",
    "sklearn": "scikit-learn",
    "yaml": "PyYAML",
    "PIL": "pillow",
    "skimage": "scikit-image",
    "bs4": "beautifulsoup4",
    "dateutil": "python-dateutil",
    "dotenv": "python-dotenv",
    "attr": "attrs",
    "jwt": "PyJWT",
    "zmq": "pyzmq",
    "serial": "pyserial",
    "fitz": "PyMuPDF",
    "Crypto": "pycryptodome",
    "git": "GitPython",
    "flash_attn": "flash-attn",
    "google.protobuf": "protobuf",
    "mamba_ssm": "mamba-ssm",
    "causal_conv1d": "causal-conv1d",
    "sentence_transformers": "sentence-transformers",
    "pytorch_lightning": "pytorch-lightning",
    "torch_geometric": "torch-geometric",
    "lm_eval": "lm-eval",
    "hydra": "hydra-core",
    "faiss": "faiss-cpu",
    "pkg_resources": "setuptools",
    "Bio": "biopython",
    "OpenGL": "PyOpenGL",
    "magic": "python-magic",
    "docx": "python-docx",
    "MySQLdb": "mysqlclient",
    "websocket": "websocket-client",
    "huggingface_hub": "huggingface-hub",
    "typing_extensions": "typing-extensions",
}
