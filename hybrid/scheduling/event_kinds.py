"""What each plan counts, by kind, and which kinds are pulls, pushes, peer rows (docs/design.md section 6).

The cluster state's event kinds (``cython_ext/cluster_state.pyx``) plus
FAE's, which happen outside the state: the hot rows read into every
worker's replica when a cold strip ends (``hot_pull``, rows per worker), the
replica written to the PS when a hot strip ends (``hot_push``), and the hot
rows whose gradients a hot iteration allreduces (``hot_allreduce``, counted
apart from transmissions, as HET's version checks are); and, with row-wise
Adagrad for embeddings, the rows several workers train whose gradients are
summed over the workers before the update (``shared_allreduce``, likewise).
"""
from hybrid._ext.cluster_state import (
    CHECK_KINDS, KIND_NAMES as STATE_KINDS, PEER_KINDS, PULL_KINDS as STATE_PULLS, PUSH_KINDS as STATE_PUSHES,
    UPDATE_KINDS,
)

FAE_KINDS = ("hot_pull", "hot_push", "hot_allreduce")
EXTRA_KINDS = FAE_KINDS + ("shared_allreduce",)  # counted outside the cluster state
KINDS = STATE_KINDS + EXTRA_KINDS
PULL_KINDS = STATE_PULLS + ("hot_pull",)
PUSH_KINDS = STATE_PUSHES + ("hot_push",)
ALLREDUCE_KINDS = ("hot_allreduce", "shared_allreduce")
TRANSMISSION_KINDS = PULL_KINDS + PUSH_KINDS + PEER_KINDS  # the rows that cross a link (docs/design.md section 6)

__all__ = ["ALLREDUCE_KINDS", "CHECK_KINDS", "EXTRA_KINDS", "FAE_KINDS", "KINDS", "PEER_KINDS", "PULL_KINDS",
           "PUSH_KINDS", "STATE_KINDS", "TRANSMISSION_KINDS", "UPDATE_KINDS"]
