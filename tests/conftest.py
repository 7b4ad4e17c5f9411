"""Hypothesis settings profiles for the whole suite.

``HYPOTHESIS_PROFILE=soak`` turns the stateful tests into a long soak (see
``tests/kvmanager/test_radix_stateful.py``): ``PBKV_SOAK_EXAMPLES`` examples (default
14,000) of up to ``PBKV_SOAK_STEPS`` steps each (default 100). The KV-manager machine
averages about 74 steps per example at these settings (measured: 111,529 over 1,500), so
the default is about 10^6 steps. Any other value names a registered profile; unset,
Hypothesis's defaults apply.
"""

import os
import sys

from hypothesis import HealthCheck, settings

settings.register_profile(
    "soak",
    max_examples=int(os.environ.get("PBKV_SOAK_EXAMPLES", "14000")),
    stateful_step_count=int(os.environ.get("PBKV_SOAK_STEPS", "100")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
if os.environ.get("HYPOTHESIS_PROFILE"):
    settings.load_profile(os.environ["HYPOTHESIS_PROFILE"])


def pytest_terminal_summary(terminalreporter):
    """Report how many states the stateful KV-manager machine checked (the soak's figure)."""
    module = sys.modules.get("tests.kvmanager.test_radix_stateful")
    steps = module.STEPS_RUN[0] if module is not None else 0
    if steps:
        machine = module.KVManagerMachine.TestCase.settings
        terminalreporter.write_line(
            f"stateful KV manager: {steps:,} states checked after steps "
            f"(max_examples {machine.max_examples:,}, "
            f"stateful_step_count {machine.stateful_step_count})"
        )
