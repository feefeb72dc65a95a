"""The CPU reference policy server: one server for every family that brings its part of it
(``Family.reference``), its server-side policies (hold, scripted expert) and its batch slot."""
