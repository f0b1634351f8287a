"""Write arithmetic prompts for the SmolLM2 example: `python examples/smollm2/make_data.py OUT.jsonl [N] [SEED]`.

Each line is {"prompt": "What is 17 + 5? Answer with the number only.", "answer": "22"}: additions and
subtractions of numbers from 1 to 20, generated locally from a seeded RNG (same N and seed, same file).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

INSTRUCTION = "Answer with the number only."


def make_records(count: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    records = []
    for _ in range(count):
        a, b = rng.randint(1, 20), rng.randint(1, 20)
        op = rng.choice("+-")
        value = a + b if op == "+" else a - b
        records.append({"prompt": f"What is {a} {op} {b}? {INSTRUCTION}", "answer": str(value)})
    return records


def main(argv: list[str]) -> None:
    if not 1 <= len(argv) <= 3:
        raise SystemExit(__doc__.splitlines()[0])
    out = Path(argv[0])
    count = int(argv[1]) if len(argv) > 1 else 64
    seed = int(argv[2]) if len(argv) > 2 else 0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r) + "\n" for r in make_records(count, seed)))
    print(f"wrote {count} prompts to {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
