"""Triton python-backend entry point; the model lives in chaoskit.reference.triton_model."""

from chaoskit.reference.triton_model import TritonPythonModel  # noqa: F401
