"""``python -m pbkv.cli``: the ``pbkv`` command."""

import sys

from pbkv.cli import main

sys.exit(main())
