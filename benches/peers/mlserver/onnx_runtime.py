"""MLServer custom runtime: the example MLP in ONNX Runtime.

`mlserver.MLModel` subclass named by model-settings.json
(`"implementation": "onnx_runtime.OnnxRuntime"`). The ONNX file is
$PEER_MODEL when set (scripts/bench-peers sets it), else the model
settings' `parameters.uri` (relative to this folder). ONNX Runtime: one
session, PEER_ORT_THREADS intra-op threads (default 1). Inference runs
inline in the async `predict`, as MLServer's own runtimes do (with
parallel_workers 0, in the server's one process).

Inputs are decoded with MLServer's NumpyCodec (a gRPC request with
raw_input_contents arrives as raw bytes and is answered in
raw_output_contents); outputs are encoded as FP32 tensors named as the
ONNX graph names them (`logits`).
"""

import os

import numpy as np
import onnxruntime as ort

from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.errors import InferenceError
from mlserver.types import InferenceRequest, InferenceResponse
from mlserver.utils import get_model_uri


class OnnxRuntime(MLModel):
    async def load(self) -> bool:
        path = os.environ.get("PEER_MODEL") or await get_model_uri(self._settings)
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(os.environ.get("PEER_ORT_THREADS", "1"))
        options.inter_op_num_threads = 1
        self._session = ort.InferenceSession(
            path, options, providers=["CPUExecutionProvider"]
        )
        self._input_names = [i.name for i in self._session.get_inputs()]
        self._output_names = [o.name for o in self._session.get_outputs()]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        by_name = {i.name: i for i in payload.inputs}
        feeds = {}
        for name in self._input_names:
            if name not in by_name:
                raise InferenceError(f"missing input '{name}'")
            array = NumpyCodec.decode_input(by_name[name])
            feeds[name] = np.ascontiguousarray(array, dtype=np.float32)
        results = self._session.run(self._output_names, feeds)
        return InferenceResponse(
            id=payload.id,
            model_name=self.name,
            model_version=self.version,
            outputs=[
                NumpyCodec.encode_output(name, result)
                for name, result in zip(self._output_names, results)
            ],
        )
