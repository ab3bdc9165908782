"""The supported vLLM releases (`releases.RELEASES`), printed for packaging and CI.

    python -m vllm_sampling_mask.tools.release_list --ci-tiers    # CI's tier loop, newest first
    python -m vllm_sampling_mask.tools.release_list --newest-cpu  # what `.[cpu]` installs fresh
    python -m vllm_sampling_mask.tools.release_list --extras      # the extras' requirements
    python -m vllm_sampling_mask.tools.release_list --list        # every release, oldest first

(`.ci/run` reads its release list here; `setup.py` the extras.)
"""

from __future__ import annotations

import argparse

from vllm_sampling_mask import releases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vllm_sampling_mask.tools.release_list",
        description="The supported vLLM releases, as packaging and CI read them.")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--list", action="store_true", help="every release, oldest first")
    group.add_argument("--newest-cpu", action="store_true",
                       help="the release a fresh `pip install \".[cpu]\"` gets")
    group.add_argument("--ci-tiers", action="store_true",
                       help="the releases CI's tier loop installs, newest first")
    group.add_argument("--extras", action="store_true", help="EXTRA REQUIREMENT lines")
    args = parser.parse_args(argv)
    if args.list:
        print(" ".join(releases.SUPPORTED))
    elif args.newest_cpu:
        print([r.version for r in releases.RELEASES if r.cpu_extra][-1])
    elif args.ci_tiers:
        print(" ".join(releases.ci_tiers()))
    else:
        for name, req in releases.extras().items():
            print(name, req)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
