"""The bundled fault steps (`include:` in a method), shipped as the package chaoskit.library.faults (found with chaoskit.paths.library("faults"))."""
