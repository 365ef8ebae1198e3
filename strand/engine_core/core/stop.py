"""When a request stops, checked after each appended token (stop strings are handled outside)."""

from __future__ import annotations

from strand.engine_core.core.request import Request, RequestStatus


def check_stop(request: Request, max_model_len: int) -> bool:
    """Set the finished status and return True if the last output token ends the request.

    Order: below min_tokens, EOS and stop ids do not stop; EOS (unless ignore_eos); a stop
    token id (recorded as stop_reason); then the length limits, which apply even below
    min_tokens so a request never outgrows max_model_len.
    """
    params = request.sampling_params
    num_output = len(request.output_token_ids)
    if num_output >= params.min_tokens:
        last = request.output_token_ids[-1]
        if last == request.eos_token_id and not params.ignore_eos:
            request.status = RequestStatus.FINISHED_STOPPED
            return True
        if params.stop_token_ids and last in params.stop_token_ids:
            request.status = RequestStatus.FINISHED_STOPPED
            request.stop_reason = last
            return True
    if num_output >= request.max_tokens or len(request.all_token_ids) >= max_model_len:
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    return False
