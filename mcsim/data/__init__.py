"""Package data: model and hardware catalogs, bundled traces."""
