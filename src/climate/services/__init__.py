"""Use cases: validate, plan, persist, each in one transaction."""
