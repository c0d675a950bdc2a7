"""Labs: learners write real parts of the engine; the engine runs on them; a grader checks them.

``grade(lab, path)`` grades a learner's file (``minengine/labs/grading.py``); ``LABS`` lists the labs
(``registry.py``); ``EngineConfig(labs={lab: path})`` builds the engine on the learner's parts (``door.py``).
Teachers: ``labs/README.md``.
"""

from minengine.labs.grading import Check, GradeReport, LabFailure, grade
from minengine.labs.registry import LABS, LabSpec

__all__ = ["LABS", "Check", "GradeReport", "LabFailure", "LabSpec", "grade"]
