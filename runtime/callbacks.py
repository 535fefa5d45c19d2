"""The step-callback interface, at the import path it had before it moved to core/callbacks.py."""
from core.callbacks import CallbackList, StepCallback  # noqa: F401
