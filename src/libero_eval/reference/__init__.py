"""The CPU reference policy server: SGLang's action API (Cosmos3 and π0.5 forms) over FastAPI,
its server-side policies (hold, scripted expert) and its image check."""
