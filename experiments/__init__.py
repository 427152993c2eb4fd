"""The bundled experiments (`chaoskit run NAME`), shipped as the package chaoskit.library.experiments (found with chaoskit.paths.library("experiments"))."""
