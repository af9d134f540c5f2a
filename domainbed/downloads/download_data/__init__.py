"""Data files the downloads need (DomainNet's duplicate list); see SOURCES.md."""
