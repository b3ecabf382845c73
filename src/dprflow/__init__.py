"""dprflow: dense passage retrieval pre-training and fine-tuning, reproduced as a Snakemake workflow.

Library code lives in this package and never parses arguments; each workflow rule runs one
``python -m dprflow.stages.<rule>`` module, a thin command-line layer over the library.
"""

__version__ = "0.1.0"
