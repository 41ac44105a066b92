"""What pyxrt accepts, for every class and method flm-serve's NPU path calls.

Written by hand from XRT's bindings, `src/python/pybind11/src/pyxrt.cpp` at Xilinx/XRT
commit 963c58ee224491e191b3be78d76f51e55e152177 (2026-08-20, XRT 2.26), and the classes'
headers (`src/runtime_src/core/include/xrt/xrt_kernel.h` and `experimental/xrt_kernel.h`).
Not derived from our adapter or simulator, so that neither can drift with the other.

`FORMS` maps "class" (its constructor) or "class.method" to every argument form the
binding defines there, each a tuple of kinds:
  int            a Python int (pybind11 also converts numpy integers; never bool here)
  str            a Python str (std::string: a pathlib.Path does not convert)
  buffer         anything with the buffer protocol (bytes, a numpy array)
  <class>        an object of that pyxrt class: device, uuid, xclbin, elf, hw_context,
                 kernel (ext.kernel is one), run, bo, module
  <enum>         a member of that pyxrt enum: bo.flags, xclBOSyncDirection, xrt_info_device,
                 hw_context.access_mode, kernel.cu_access_mode, ...
  ...            `kernel.__call__` takes any number of arguments; it sets each it can as a
                 bo or an int and silently drops the others (see ARGS_OF_CALL)
A form marked in UNREACHABLE exists in C++ but no Python value converts to it.
"""

from __future__ import annotations

XRT_COMMIT = "963c58ee224491e191b3be78d76f51e55e152177"

FORMS: dict[str, list[tuple[str, ...]]] = {
    # xrt::device
    "device": [(), ("int",), ("str",)],
    "device.register_xclbin": [("xclbin",)],
    "device.get_info": [("xrt_info_device",)],
    # xrt::xclbin and its kernels' metadata
    "xclbin": [(), ("str",), ("axlf",)],
    "xclbin.get_kernels": [()],
    "xclbin.get_uuid": [()],
    "xclbinkernel.get_name": [()],
    "xclbinkernel.get_num_args": [()],
    # xrt::elf (the full-ELF flow)
    "elf": [("str",), ("buffer", "int")],
    # xrt::hw_context: (device, uuid) since XRT 2.1x; the ELF and xclbin forms from 2.23+
    "hw_context": [(), ("device", "uuid"), ("device", "uuid", "hw_context.access_mode"),
                   ("device", "uuid", "cfg_param"), ("device", "xclbin"),
                   ("device", "xclbin", "hw_context.access_mode"),
                   ("device", "xclbin", "cfg_param"), ("device", "str"),
                   ("device", "str", "hw_context.access_mode"), ("device", "str", "cfg_param"),
                   ("device", "cfg_param", "hw_context.access_mode"), ("device", "elf"),
                   ("device", "elf", "cfg_param", "hw_context.access_mode")],
    # xrt::kernel (and the deprecated device/uuid forms kept as a shim)
    "kernel": [("hw_context", "str"), ("device", "uuid", "str"),
               ("device", "uuid", "str", "kernel.cu_access_mode")],
    "kernel.__call__": [("...",)],
    "kernel.group_id": [("int",)],
    "ext.kernel": [("hw_context", "str"), ("hw_context", "module", "str")],
    # xrt::run
    "run": [(), ("kernel",)],
    "run.set_arg": [("int", "bo"), ("int", "int")],
    "run.start": [()],
    "run.wait": [(), ("int",)],  # an unsigned int of milliseconds; returns ert_cmd_state
    "run.state": [()],
    # the run's control scratchpad (an ELF kernel's run; throws where the ELF has none)
    "run.get_ctrl_scratchpad_bo": [()],
    # xrt::runlist: wait() returns None and raises runlist::command_error on a failed run
    "runlist": [(), ("hw_context",)],
    "runlist.add": [("run",)],
    "runlist.execute": [()],
    "runlist.wait": [(), ("chrono.milliseconds",)],
    # xrt::bo
    "bo": [("device", "int", "bo.flags", "int"), ("hw_context", "int", "bo.flags", "int"),
           ("hw_context", "int", "int"), ("bo", "int", "int")],
    "bo.write": [("buffer", "int")],
    "bo.read": [("int", "int")],  # returns a numpy array of char (int8)
    "bo.sync": [("xclBOSyncDirection", "int", "int"), ("xclBOSyncDirection",)],
    "bo.map": [()],
    "bo.size": [()],
    "bo.address": [()],
}

# pyxrt.cpp includes pybind11/stl.h, numpy.h and stl_bind.h but not chrono.h: a
# std::chrono::milliseconds parameter converts from no Python value
UNREACHABLE = {("runlist.wait", ("chrono.milliseconds",))}

# run.state() on a run added to a runlist: "cannot be called for run objects that are part
# of a runlist" (experimental/xrt_kernel.h, runlist::add)
FORBIDDEN = {"run.state on a run of a runlist"}

ARGS_OF_CALL = {"int", "bo"}  # what kernel.__call__ can set; it drops anything else

# names read as attributes (enum members and the bo flags' aliases)
ATTRIBUTES = {
    "bo.normal", "bo.cacheable", "bo.device_only", "bo.host_only", "bo.p2p", "bo.svm",
    "xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE",
    "xclBOSyncDirection.XCL_BO_SYNC_BO_FROM_DEVICE",
    "ert_cmd_state.ERT_CMD_STATE_NEW", "ert_cmd_state.ERT_CMD_STATE_QUEUED",
    "ert_cmd_state.ERT_CMD_STATE_COMPLETED", "ert_cmd_state.ERT_CMD_STATE_ERROR",
    "ert_cmd_state.ERT_CMD_STATE_ABORT", "ert_cmd_state.ERT_CMD_STATE_SUBMITTED",
    "ert_cmd_state.ERT_CMD_STATE_TIMEOUT", "ert_cmd_state.ERT_CMD_STATE_NORESPONSE",
    "xrt_info_device.bdf", "xrt_info_device.name",
}

# the XRT release each binding first ships in (its commit in XRT's master, where the
# version then said 2.20 and 2.23): older pyxrt modules lack the name or the form
SINCE = {("runlist", None): (2, 21), ("ext.kernel", None): (2, 21),
         ("hw_context", ("device", "elf")): (2, 23),
         # 6dd06dc947 (2026-05-14), master then 2.23; the first release with it is 2.25
         ("run.get_ctrl_scratchpad_bo", ()): (2, 25)}
