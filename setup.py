"""Only what pyproject.toml cannot say: the start-up hook file (see eagle3_plugin/vllm/cli.py) goes to
site-packages itself, in wheels and editable installs alike."""

import sysconfig

from setuptools import setup

SITE_PACKAGES = sysconfig.get_path("purelib", vars={"base": ".", "platbase": "."})  # relative to the prefix

setup(data_files=[(SITE_PACKAGES, ["eagle3_plugin_vllm_cli.pth"])])
