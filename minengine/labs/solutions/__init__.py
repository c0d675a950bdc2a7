"""The labs' reference solutions: each module is the whole part a learner writes, with the skeleton's interface."""
