"""Print reward and response length per step of one or more runs: `python show_metrics.py RUN/metrics.jsonl...`."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def rows(path: Path) -> list[str]:
    out = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        parts = " ".join(f"{k}={v:.3f}" for k, v in sorted(record.get("reward_parts", {}).items()))
        out.append(
            f"step {record['step']:>3}  reward {record['reward_mean']:.3f} ({parts})  "
            f"response length {record['response_len_mean']:.1f} tokens  step {record['step_s']:.1f} s"
        )
    return out


def main(paths: list[str]) -> None:
    if not paths:
        raise SystemExit(__doc__)
    for name in paths:
        print(name)
        for row in rows(Path(name)):
            print("  " + row)


if __name__ == "__main__":
    main(sys.argv[1:])
