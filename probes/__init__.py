"""The bundled probes (`include:` in a steady state), shipped as the package chaoskit.library.probes (found with chaoskit.paths.library("probes"))."""
