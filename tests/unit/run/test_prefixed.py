from __future__ import annotations

import sys
import threading

from kvrig.run import prefixed


def test_each_line_comes_prefixed_with_its_process_name(capsys) -> None:
    command = [sys.executable, "-c", "print('one'); print('two'); raise SystemExit(3)"]
    assert prefixed.run("cuda-sm90-emulated", command) == 3
    assert capsys.readouterr().out.splitlines() == [
        "[cuda-sm90-emulated] one",
        "[cuda-sm90-emulated] two",
    ]


def test_two_processes_side_by_side_never_share_a_line(capsys) -> None:
    script = "import sys\nfor i in range(200): print('x' * 50, i, flush=True)"
    command = [sys.executable, "-c", script]
    codes: list[int] = []
    runs = [
        threading.Thread(target=lambda n=n: codes.append(prefixed.run(n, command)))
        for n in ("a", "b")
    ]
    for t in runs:
        t.start()
    for t in runs:
        t.join()
    lines = capsys.readouterr().out.splitlines()
    assert codes == [0, 0] and len(lines) == 400
    assert all(line.startswith(("[a] xxx", "[b] xxx")) and line.count("[") == 1 for line in lines)
