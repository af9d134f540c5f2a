"""Packaging for the OOD-generalization benchmark (DomainBed-compatible core + analysis)."""
from setuptools import find_packages, setup

ANALYSIS = ["scikit-learn>=1.3", "ruptures>=1.1", "optuna>=3.0"]
GENERATION = ["diffusers>=0.30", "transformers>=4.40", "accelerate>=0.30"]

setup(
    name="oodbed",
    version="0.1.0",
    description="DomainBed-compatible benchmark for out-of-distribution generalization, "
                "with accuracy-on-the-line, OODSelect, validity and OoD-Bench analyses",
    python_requires=">=3.10",
    packages=find_packages(include=["domainbed*", "analysis*", "ood_bench*", "spawrious*"]),
    include_package_data=True,
    install_requires=[
        "torch>=2.4",
        "torchvision>=0.19",
        "numpy",
        "pandas",
        "scipy",
        "Pillow",
        "tqdm",
        "matplotlib",
        "mlxtend",
    ],
    extras_require={
        "analysis": ANALYSIS,
        "generation": GENERATION,
        "slurm": ["submitit>=1.5"],
        "ray": ["ray>=2.9"],
        "test": ["pytest>=7", "pytest-xdist", "submitit>=1.5", "ray>=2.9"] + ANALYSIS + GENERATION,
    },
    entry_points={"console_scripts": []},
)
