"""What reads judged cells: results rows, report, repro lines, release gate, CI pipelines."""
