"""Apps: ``souq.toml`` (fly.toml's shape) and the machine configs it makes. Pure."""

from souq.apps.config import AppConfig, load_app_config
from souq.apps.toml import TomlText, line_of

__all__ = ["AppConfig", "TomlText", "line_of", "load_app_config"]
