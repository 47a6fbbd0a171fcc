"""Operation traces of a real decoder: recording, pricing on hardware profiles, calibration, Ollama, ``mcsim trace``."""
