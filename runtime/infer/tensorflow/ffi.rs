//! TensorFlow's C API (`tensorflow/c/c_api.h`, `tf_tensor.h`,
//! `tf_tstring.h`), as the functions of a library opened at run time.
//!
//! Nothing links against TensorFlow at build time: the library comes from
//! the `tensorflow-cpu` PyPI wheel (`libtensorflow_cc.so.2`, which pulls in
//! `libtensorflow_framework.so.2` beside it) or TensorFlow's C library
//! (`libtensorflow.so.2`), found by `library`. Each function is looked up
//! once, when the library loads; a library missing one is refused there,
//! naming it, rather than failing on the first request.

use std::ffi::{c_char, c_int, c_void};

/// `TF_Status*`, `TF_Graph*`, … : handles the library owns.
#[repr(C)]
pub struct Opaque {
    _private: [u8; 0],
}

/// `TF_Output`: one output of an operation.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Output {
    pub oper: *mut Opaque,
    pub index: c_int,
}

// SAFETY: an operation handle is a pointer into its graph, which is never
// changed after the SavedModel loaded and outlives every use (the backend
// owns both); TF_SessionRun only reads it.
unsafe impl Send for Output {}
// SAFETY: as for Send: nothing mutates through it.
unsafe impl Sync for Output {}

/// `TF_Buffer`.
#[repr(C)]
pub struct Buffer {
    pub data: *const c_void,
    pub length: usize,
    pub data_deallocator: Option<unsafe extern "C" fn(*mut c_void, usize)>,
}

/// `TF_TString`: 24 bytes TensorFlow initialises and frees itself.
#[repr(C, align(8))]
pub struct TString {
    _bytes: [u8; 24],
}

/// `TF_Code` values, which are gRPC's.
pub const TF_OK: c_int = 0;

type Status = *mut Opaque;

macro_rules! api {
    ($($name:ident = $symbol:literal : fn($($arg:ty),*) $(-> $ret:ty)?;)*) => {
        /// The C API's functions, resolved from one loaded library.
        pub struct Api {
            $(pub $name: unsafe extern "C" fn($($arg),*) $(-> $ret)?,)*
            // Keeps the library mapped as long as the pointers above live.
            _library: libloading::Library,
        }

        impl Api {
            /// Resolves every function from `library`; the error names the
            /// first one missing.
            ///
            /// # Safety
            /// `library` must be TensorFlow's C API, whose functions have
            /// the signatures declared here (TensorFlow 2.x).
            pub unsafe fn resolve(library: libloading::Library) -> Result<Api, String> {
                Ok(Api {
                    $($name: *unsafe { library.get::<unsafe extern "C" fn($($arg),*) $(-> $ret)?>($symbol) }
                        .map_err(|e| format!("{} is missing: {e}", String::from_utf8_lossy(&$symbol[..$symbol.len() - 1])))?,)*
                    _library: library,
                })
            }
        }
    };
}

api! {
    version = b"TF_Version\0": fn() -> *const c_char;
    new_status = b"TF_NewStatus\0": fn() -> Status;
    delete_status = b"TF_DeleteStatus\0": fn(Status);
    get_code = b"TF_GetCode\0": fn(Status) -> c_int;
    message = b"TF_Message\0": fn(Status) -> *const c_char;
    new_buffer = b"TF_NewBuffer\0": fn() -> *mut Buffer;
    delete_buffer = b"TF_DeleteBuffer\0": fn(*mut Buffer);
    new_graph = b"TF_NewGraph\0": fn() -> *mut Opaque;
    delete_graph = b"TF_DeleteGraph\0": fn(*mut Opaque);
    graph_operation_by_name = b"TF_GraphOperationByName\0": fn(*mut Opaque, *const c_char) -> *mut Opaque;
    operation_num_outputs = b"TF_OperationNumOutputs\0": fn(*mut Opaque) -> c_int;
    new_session_options = b"TF_NewSessionOptions\0": fn() -> *mut Opaque;
    delete_session_options = b"TF_DeleteSessionOptions\0": fn(*mut Opaque);
    set_config = b"TF_SetConfig\0": fn(*mut Opaque, *const c_void, usize, Status);
    load_session_from_saved_model = b"TF_LoadSessionFromSavedModel\0":
        fn(*const Opaque, *const Buffer, *const c_char, *const *const c_char, c_int, *mut Opaque, *mut Buffer, Status)
            -> *mut Opaque;
    close_session = b"TF_CloseSession\0": fn(*mut Opaque, Status);
    delete_session = b"TF_DeleteSession\0": fn(*mut Opaque, Status);
    session_run = b"TF_SessionRun\0": fn(
        *mut Opaque,
        *const Buffer,
        *const Output,
        *const *mut Opaque,
        c_int,
        *const Output,
        *mut *mut Opaque,
        c_int,
        *const *const Opaque,
        c_int,
        *mut Buffer,
        Status
    );
    allocate_tensor = b"TF_AllocateTensor\0": fn(c_int, *const i64, c_int, usize) -> *mut Opaque;
    delete_tensor = b"TF_DeleteTensor\0": fn(*mut Opaque);
    tensor_type = b"TF_TensorType\0": fn(*const Opaque) -> c_int;
    num_dims = b"TF_NumDims\0": fn(*const Opaque) -> c_int;
    dim = b"TF_Dim\0": fn(*const Opaque, c_int) -> i64;
    tensor_byte_size = b"TF_TensorByteSize\0": fn(*const Opaque) -> usize;
    tensor_data = b"TF_TensorData\0": fn(*const Opaque) -> *mut c_void;
    string_init = b"TF_StringInit\0": fn(*mut TString);
    string_copy = b"TF_StringCopy\0": fn(*mut TString, *const c_char, usize);
    string_get_data_pointer = b"TF_StringGetDataPointer\0": fn(*const TString) -> *const c_char;
    string_get_size = b"TF_StringGetSize\0": fn(*const TString) -> usize;
}
