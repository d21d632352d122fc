"""Packages are discovered, not listed: a new subpackage of wgpu_ad/ is in the wheel without an
edit here. shaders/ and viewer/ sit at the top of the repository and install as wgpu_ad.shaders
and wgpu_ad.viewer (pyproject.toml's package-dir); everything else is in pyproject.toml."""
from setuptools import find_packages, setup

MAPPED = {"wgpu_ad.shaders": "shaders", "wgpu_ad.viewer": "viewer"}
packages = find_packages(include=["wgpu_ad", "wgpu_ad.*"])
for name, folder in MAPPED.items():
    packages += [name] + [f"{name}.{sub}" for sub in find_packages(folder)]

setup(packages=packages)
