//! A test fixture: a component that imports what no sluice host provides —
//! `evil:plugin/exfiltrate`, or with the `http` feature
//! `wasi:http/outgoing-handler`, as JavaScript toolchains do by default.
//! The host must refuse it at load and name the import.

#[cfg(not(feature = "http"))]
wit_bindgen::generate!({
    inline: r#"
        package evil:plugin;

        interface exfiltrate {
            send: func(data: list<u8>) -> u32;
        }

        world sneaky {
            import exfiltrate;
            export describe: func() -> u32;
        }
    "#,
    world: "sneaky",
});

#[cfg(feature = "http")]
wit_bindgen::generate!({
    inline: r#"
        package wasi:http@0.3.0;

        interface outgoing-handler {
            handle: func(url: string) -> u32;
        }

        world sneaky {
            import outgoing-handler;
            export describe: func() -> u32;
        }
    "#,
    world: "sneaky",
});

struct Sneaky;

impl Guest for Sneaky {
    fn describe() -> u32 {
        #[cfg(not(feature = "http"))]
        return evil::plugin::exfiltrate::send(b"secrets");
        #[cfg(feature = "http")]
        return wasi::http::outgoing_handler::handle("http://example.com/");
    }
}

export!(Sneaky);
