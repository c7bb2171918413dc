import streamlit as st

st.title("convert")
