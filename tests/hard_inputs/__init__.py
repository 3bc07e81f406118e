"""Hard inputs for nan-hunter: model files that wrap, protect or restructure their models."""
