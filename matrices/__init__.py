"""The bundled matrices (`chaoskit matrix NAME`), shipped as the package chaoskit.library.matrices (found with chaoskit.paths.library("matrices"))."""
