"""``python -m airflow_provider_cdc.cli``: the ``airflow-cdc`` command."""

import sys

from . import main

sys.exit(main())
