"""An LLM's memory against its SoC's budget, and the largest context that fits: an ESTIMATE from the graphs.

The footprint is the shipped recipe's weights as stored, the KV cache at the configured context and the largest
activation, both at the activations' width, against the catalog's `llm_memory_mb` for the SoC (harness/socs.yaml).
For the largest context the KV cache grows with the context and so does the largest activation (an attention
score tensor does; the logits do not, so this over-counts: the context found is a lower bound); the weights stay.
"""

from __future__ import annotations

from harness.devices import SocSpec
from harness.llm import convention

__all__ = ["memory_kpis"]


def memory_kpis(pair: convention.PairInfo, weights_bytes: int, kv_cache_bytes: int, activation_bytes: int,
                soc: SocSpec, trained_context: int | None = None) -> dict:
    """Return the memory KPIs (labelled estimates): the footprint's share of the SoC's budget and the largest
    context whose footprint fits it (memory alone; `trained_context`, when known, is reported beside it)."""
    footprint = weights_bytes + kv_cache_bytes + activation_bytes
    out: dict = {"activation_bytes": int(activation_bytes), "memory_footprint_bytes": int(footprint)}
    if trained_context:
        out["trained_context_length"] = int(trained_context)
    if soc.llm_memory_mb is None:
        out["memory_basis"] = f"not estimated: the catalog has no LLM memory budget for {soc.id}"
        return out
    budget = int(soc.llm_memory_mb * 1024 * 1024)
    per_token = (kv_cache_bytes + activation_bytes) / pair.context_length
    largest = max(0, int((budget - weights_bytes) // per_token))
    out |= {"soc_memory_budget_bytes": budget, "memory_of_soc_budget": round(footprint / budget, 6),
            "max_context_length_in_budget": largest,
            "memory_basis": (
                f"estimate: {weights_bytes / 2**20:.1f} MiB weights + {kv_cache_bytes / 2**20:.2f} MiB KV cache at "
                f"context {pair.context_length} + {activation_bytes / 2**20:.2f} MiB largest activation, against "
                f"{soc.id}'s {soc.llm_memory_mb:g} MiB LLM budget in the SoC catalog; the largest context grows "
                f"the KV cache and the activation with it ({per_token / 1024:.1f} KiB per token)")}
    return out
