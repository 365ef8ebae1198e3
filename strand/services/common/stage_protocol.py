"""Which wire contract a stage speaks, so that stages of two Strand versions refuse each other by
name instead of misreading each other's messages.

Each stage is its own process (its own Deployment on Kubernetes), so a rolling upgrade runs old
and new stages side by side for a while. A changed message read by the old definition loses
fields without an error: a step's tokens moved from `outputs` to columns would read as a step
with no outputs. The contract's fingerprint is a hash of the compiled definitions of every
message the stages exchange (comments are not part of them), so it changes exactly when the wire
does. Stage callers send it (`x-strand-protocol`, and in the link's HELLO); a stage answers a
different one with FAILED_PRECONDITION naming both. A caller that sends none (grpcurl, a test
tool) is served: the check is for Strand's own stages.
"""

from __future__ import annotations

import hashlib

from strand.services._proto.strand.v1 import detokenizer_pb2, engine_pb2, tokenizer_pb2, types_pb2

PROTOCOL_HEADER = "x-strand-protocol"


def _fingerprint() -> str:
    digest = hashlib.sha256()
    for module in (types_pb2, tokenizer_pb2, engine_pb2, detokenizer_pb2):
        digest.update(module.DESCRIPTOR.serialized_pb)
    return digest.hexdigest()[:16]


PROTOCOL = _fingerprint()


def protocol_mismatch(stage: str, theirs: str | None) -> str | None:
    """The error for a caller that speaks another contract; None when it is ours or unsaid."""
    if not theirs or theirs == PROTOCOL:
        return None
    return (f"{stage} speaks stage protocol {PROTOCOL}, the caller {theirs}: the stages run "
            f"different Strand versions (run every stage at one version)")
