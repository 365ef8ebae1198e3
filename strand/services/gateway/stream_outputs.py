"""A Generate stream's outputs on their way to a client that may read slower than they come.

The gateway puts each output the moment the detokenizer's batch arrives and never waits on a
client; the stream's writer takes what gathered since its last write (engine_core's
OutputCollector). A client that stops reading holds one merged output here, not a queue as long
as its generation, and one client's pace costs no other anything. Merging happens only while a
client lags, so its conversions through engine_core's RequestOutput.add stay off the hot path.
"""

from __future__ import annotations

from strand.engine_core.output_collector import OutputCollector
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.common.convert import request_output_from_pb, request_output_to_pb


class StreamOutputs(OutputCollector[pb.RequestOutput]):
    def merge(self, pending: pb.RequestOutput, later: pb.RequestOutput) -> pb.RequestOutput:
        merged = request_output_from_pb(pending)
        merged.add(request_output_from_pb(later), aggregate=self.aggregate)
        return request_output_to_pb(merged)
