"""Audio on the wire, shared by the server and the clients: Opus through the system's libopus
(:mod:`.libopus`), Ogg Opus pages (:mod:`.ogg`) and band-limited resampling to a wire rate
(:mod:`.resample`). Nothing here knows about streams or sockets."""
