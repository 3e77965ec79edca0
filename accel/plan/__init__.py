"""The plan and its contract: what the user asks for (``Plan``: parsed from Python, a dict or a TOML/YAML file,
put in stage order), what every accelerator declares and follows (``contract``: ``Accelerator``, ``register``,
``REGISTRY``, ``State``; ``options``; what a file may set: ``untrusted``)."""
from accel.plan.plan import Plan, PlanSpec, same_options

__all__ = ["Plan", "PlanSpec", "same_options"]
