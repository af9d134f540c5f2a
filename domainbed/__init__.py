"""DomainBed-compatible training core: datasets, algorithms, training, sweeps, result tables."""
__version__ = "0.1.0"
