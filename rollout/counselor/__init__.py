"""The counselor API: ``protocol`` (schemas), ``service`` (logic), ``server`` (routes, ``build_app``, ``main``)."""
