"""OpenRFT: reinforcement fine-tuning of open-weight models on hardware you own."""

__version__ = "0.1.0"
