"""Shared pytest configuration."""

import os

# Nothing downloads at test time: Hugging Face libraries stay offline.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
