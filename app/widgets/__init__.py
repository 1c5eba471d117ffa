"""Views: each observes a Qt-free model or the EngineClient's signals and never calls the engine."""
