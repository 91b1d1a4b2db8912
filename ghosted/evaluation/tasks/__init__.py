"""Tasks that ship with Ghosted, in lm-evaluation-harness's format (YAML + a small Python loader).

``TASKS_DIR`` is given to lm-eval as ``TaskManager(include_path=TASKS_DIR)``, so lm-eval runs the
bundled tasks exactly as it runs its own; ``BUNDLED_TASKS`` names them (they need no download).
"""

from pathlib import Path

TASKS_DIR = Path(__file__).resolve().parent  # the folder lm-eval indexes for the bundled tasks
BUNDLED_TASKS = ("bundled-lastword",)  # offline tasks defined here (ghosted.evaluation.lastword)
