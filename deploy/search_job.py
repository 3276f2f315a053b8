"""Entry script for running ``archplace search`` on an existing Ray cluster.

Usage: ``python deploy/search_job.py MODEL [MODEL...] [search options]`` runs
``archplace search MODEL... [options] --address auto`` (``--address auto`` is added unless the
arguments already carry ``--address``) and exits with its return code. Two ways to launch it:

* Cluster launcher: ``ray submit deploy/cluster.yaml deploy/search_job.py -- bert-large --max-archs 50``
  copies this file to ``~/search_job.py`` on the head node and runs it there; ``auto`` finds the
  cluster that ``ray up deploy/cluster.yaml`` started on that node.
* Jobs API: ``ray job submit --address http://HEAD:8265 -- python deploy/search_job.py bert-large
  --max-archs 50`` (or ``JobSubmissionClient.submit_job``); the job's driver gets ``RAY_ADDRESS``, which
  ``auto`` resolves to. The path is relative to the job's working directory: add
  ``--working-dir .`` to upload the repository, or ``cd`` to a checkout on the head node first.

With token authentication on (the default for the clusters in deploy/cluster.yaml), the driver needs
the token; processes started by the cluster inherit it, see deploy/README.md.
"""

import sys

from archplace.cli import main


def search_argv(argv: list[str]) -> list[str]:
    has_address = any(a == "--address" or a.startswith("--address=") for a in argv)
    return ["search", *argv] if has_address else ["search", *argv, "--address", "auto"]


if __name__ == "__main__":
    sys.exit(main(search_argv(sys.argv[1:])))
