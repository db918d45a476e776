"""The LLM actor (``kind="llm"``): chat slots, a task and a language model (torch or vLLM)."""
