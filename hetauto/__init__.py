"""hetauto: plan and run one training job across clusters of different accelerators."""

__version__ = "0.1.0"
