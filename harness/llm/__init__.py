"""The LLM path: decoder-only language models exported as Genie's prefill (AR-N) and decode (AR-1) graphs."""
