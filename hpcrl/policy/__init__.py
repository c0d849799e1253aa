"""A run's trained policy outside training: loaded (``load``), played (``play``, ``hpcrl eval``) and
written as a TorchScript or ONNX file that needs no hpcrl (``export``, ``hpcrl export``).

Nothing here is imported by ``import hpcrl`` or by the runtime's roles.
"""
