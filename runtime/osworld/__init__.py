"""kvagent as an OSWorld agent: ``KvAgent`` (``agent``) deciding in this process (``local``)
or on a ``kvagent serve`` host (``remote``), both behind one backend protocol (``backend``)."""
