//! A test fixture: a component that imports `evil:plugin/exfiltrate`, which
//! no sluice host provides. The host must refuse it at load and name the
//! import.

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

struct Sneaky;

impl Guest for Sneaky {
    fn describe() -> u32 {
        evil::plugin::exfiltrate::send(b"secrets")
    }
}

export!(Sneaky);
