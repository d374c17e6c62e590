"""A markdown row per case of a `tkverify replay` log: the case's release directory, the case, its verdict
and the first line that says what happened (the worst element, the error raised, or why it could not run).

    python3 scripts/replay_table.py reports/tile-kernels-2.1.0/session8/findings-replay.log
"""

import re
import sys


def verdict_of(block: list[str]) -> tuple[str, str]:
    """(verdict, what happened) of one case's lines, the `=== path` line first."""
    for i, line in enumerate(block):
        if line in ("PASS", "FAIL"):
            if line == "PASS":
                return line, ""
            rest = [x.strip() for x in block[i + 1:] if x.strip()]
            said = [x for x in rest if x.startswith("worst at") or "raised" in x]
            why = said[0] if said else (rest[0] if rest else "")
            return line, why[why.index("raised"):] if "raised" in why else why
        if line.startswith("tkverify replay:") and "lacks" in line:  # the release has no such op
            return "CANNOT RUN", line.split(":", 1)[1].strip()
        if line.startswith("UNSUPPORTED:"):
            return "UNSUPPORTED", line.split(":", 1)[1].strip()
    return "?", "no verdict in the log (cut by its cap?)"


def main(log: str) -> None:
    for block in re.split(r"^=== ", open(log).read(), flags=re.M)[1:]:
        lines = block.splitlines()
        path = lines[0].strip()
        verdict, why = verdict_of(lines)
        release = re.search(r"tile-kernels-([\d.]+)/", path)
        release = release.group(1) if release else "?"
        print(f"| {release} | `{path.split('/cases/')[-1]}` | {verdict} | {why[:160].replace('|', '/')} |")


if __name__ == "__main__":
    main(sys.argv[1])
